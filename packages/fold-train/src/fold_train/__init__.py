"""fold-train: Training, prediction and evaluation for fold models: the fold-train CLI."""

__version__ = "0.1.0"
