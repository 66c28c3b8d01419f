"""The SGLang patch sets: apply, check and revert one (apply), find an installation (locate), edit one (regen)."""
