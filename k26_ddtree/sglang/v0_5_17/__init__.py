"""DDTree inside SGLang 0.5.17's overlap DFlash worker (DFlashWorkerV2)."""
