"""Framework integrations: Lightning, Hugging Face Trainer, zero-code torch patching, torch.monitor.

Why nothing is imported here: each integration imports its framework, and the base install must
not import (or require) Lightning or transformers. Import the module you need, e.g.
``from traintel.integrations.lightning import TraintelCallback``.
"""
