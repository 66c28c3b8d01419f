"""The SGLang 0.5.11 patch set: generate it (regen), find an installation (locate), apply/check/revert it."""
