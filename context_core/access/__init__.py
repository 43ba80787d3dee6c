"""Access: API keys, organisations and canonical user ids, compliance profiles, namespace ACLs."""
