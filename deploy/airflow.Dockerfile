# Airflow 3 with the platform installed, so the thin DAG files can import their logic.
FROM apache/airflow:3.0.6-python3.11

ENV HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
COPY --chown=airflow:root pyproject.toml README.md /opt/ctx/
COPY --chown=airflow:root requirements /opt/ctx/requirements
COPY --chown=airflow:root context_core /opt/ctx/context_core
COPY --chown=airflow:root context_app /opt/ctx/context_app
COPY --chown=airflow:root evaluation /opt/ctx/evaluation
COPY --chown=airflow:root loadtests /opt/ctx/loadtests

# Keep the image's own Airflow: install torch (CPU) and the project without touching it.
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" \
    && pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" /opt/ctx
