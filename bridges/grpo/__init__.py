"""The bundled reference GRPO trainer (``backend=grpo``); the loop is in ``trainer.py``."""
