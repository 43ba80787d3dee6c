"""Who a record belongs to: the organisation from the credential, the user in one canonical form.

Many organisations share one deployment. The organisation of every request is the one of the
API key that signed it (:class:`context_core.access.auth.AgentKey.org`), never a field of the body.
A user id means something only inside its organisation, so every record that belongs to a user
is keyed by the pair (org, user): ``pref:{<org>:<user>}:<type>``
(:mod:`context_core.working_memory.keys`), the compliance store's rows, the traces' hashed
user fields.

**The canonical user id** (:func:`canonical_user_id`), applied wherever a user id is compared
or becomes part of a key:

1. Unicode NFKC (full-width ``ｕ-ｎａｒｒｏｗ`` is ``u-narrow``, ligatures and compatibility
   forms are folded);
2. leading and trailing white space removed;
3. case-folded (``U-NARROW`` is ``u-narrow``; ``Straße`` is ``strasse``), then NFKC again;
4. refused with :class:`~context_core.errors.InvalidIdError` (a 422 in the service, naming the
   field and this rule) when what is left is empty or longer than :data:`USER_ID_MAX_CHARS`,
   holds a control, format, private-use, unassigned or default-ignorable code point (zero-width
   spaces, soft hyphens, the combining grapheme joiner, variation selectors, bidi controls,
   tag characters...), white space inside, or letters of scripts that Unicode's "highly
   restrictive" profile (UTS #39 section 5.2) does not allow together: one script, or Latin
   with Han and Japanese kana, Latin with Han and Bopomofo, Latin with Han and Hangul. Digits
   and punctuation (script Common) and combining marks (Inherited) go with any script.

So ``U-NARROW``, ``u-narrow `` and ``ｕ－ｎａｒｒｏｗ`` are the same user as ``u-narrow``, and
``u-n\\u200barrow`` or ``u-nаrrow`` (a Cyrillic ``а``) are refused instead of becoming a
fresh user with no restrictions. What this does not do: two *different* whole-script ids that
merely look alike (an all-Cyrillic ``ѕсоре`` and a Latin ``scope``) stay two users, as they may
be in a real directory; and ids are not matched on confusable skeletons, which would merge
real users (``user1`` and ``userl``). Scripts come from Unicode's ``Scripts.txt`` as shipped by
the ``confusable-homoglyphs`` package; the default-ignorable set from :mod:`.skeleton`.

It lives in the gateway (with :mod:`.skeleton`, whose data it uses) because session state,
working-memory keys and the access checks all canonicalise ids: it sits below all of them.
:mod:`context_core.gateway.identity` re-exports it under its former name.
"""

from __future__ import annotations

import functools
import unicodedata

from context_core.errors import InvalidIdError

__all__ = [
    "CANONICAL_USER_ID_RULE",
    "DEFAULT_ORG",
    "USER_ID_MAX_CHARS",
    "canonical_user_id",
]

#: The organisation of an API key that names none, and of in-process library use.
DEFAULT_ORG = "default"
#: The longest canonical user id, in code points.
USER_ID_MAX_CHARS = 128
#: Raw input longer than this is refused before any normalisation (bounded work per id).
_RAW_MAX_CHARS = 4 * USER_ID_MAX_CHARS

#: The rule in one line, as error bodies and the README state it.
CANONICAL_USER_ID_RULE = (
    "user ids are compared in canonical form: NFKC, trimmed, case-folded; 1-128 characters "
    "without control, invisible or default-ignorable characters, without white space inside, "
    "and without letters of scripts mixed as look-alikes do (one script, or Latin with "
    "Han/kana, Han/Bopomofo or Han/Hangul)"
)

#: Script combinations UTS #39 "highly restrictive" allows besides a single script.
_ALLOWED_MIXES = (
    frozenset({"LATIN", "HAN", "HIRAGANA", "KATAKANA"}),
    frozenset({"LATIN", "HAN", "BOPOMOFO"}),
    frozenset({"LATIN", "HAN", "HANGUL"}),
)
_NEUTRAL_SCRIPTS = frozenset({"COMMON", "INHERITED"})


@functools.lru_cache(maxsize=8192)
def _script(ch: str) -> str:
    from confusable_homoglyphs import categories

    return str(categories.alias(ch))


@functools.lru_cache(maxsize=8192)
def _refused_char(ch: str) -> str | None:
    """Why ``ch`` may not stand in a canonical id, or None."""
    from context_core.gateway.skeleton import is_default_ignorable

    cat = unicodedata.category(ch)
    if is_default_ignorable(ch):
        return "an invisible (default-ignorable) character"
    if cat[0] == "C":
        return "a control, format, private-use or unassigned character"
    if cat[0] == "Z" or ch.isspace():
        return "white space"
    return None


def _fail(field: str, why: str) -> InvalidIdError:
    return InvalidIdError(
        f"invalid {field}: {why}; {CANONICAL_USER_ID_RULE}",
        field=field,
        rule=(CANONICAL_USER_ID_RULE),
    )


def canonical_user_id(raw: object, field: str = "user_id") -> str:
    """``raw`` in canonical form (see the module doc), or :class:`InvalidIdError` naming
    ``field``. Idempotent: a canonical id is returned unchanged."""
    if not isinstance(raw, str):
        raise _fail(field, f"expected a string, got {type(raw).__name__}")
    if len(raw) > _RAW_MAX_CHARS:
        raise _fail(field, f"{len(raw)} characters, over {USER_ID_MAX_CHARS}")
    if raw.isascii():
        s = raw.strip().lower()  # ASCII: NFKC is the identity and casefold is lower()
    else:
        s = unicodedata.normalize("NFKC", raw).strip().casefold()
        s = unicodedata.normalize("NFKC", s)
    if not s:
        raise _fail(field, "empty or only white space")
    if len(s) > USER_ID_MAX_CHARS:
        raise _fail(field, f"{len(s)} characters after normalisation, over {USER_ID_MAX_CHARS}")
    scripts: set[str] = set()
    for i, ch in enumerate(s):
        if ch.isascii() and (ch.isalnum() or ch in "-_.@+~=!#$%&'/^`|"):
            if ch.isalpha():
                scripts.add("LATIN")
            continue
        why = _refused_char(ch)
        if why is not None:
            raise _fail(field, f"{why} (U+{ord(ch):04X}) at position {i}")
        script = _script(ch)
        if script not in _NEUTRAL_SCRIPTS:
            scripts.add(script)
    if len(scripts) > 1 and not any(scripts <= mix for mix in _ALLOWED_MIXES):
        names = ", ".join(sorted(s.title() for s in scripts))
        raise _fail(field, f"letters of several scripts ({names}), as look-alike ids have")
    return s
