"""Tiny-model recipe: corpora (package registries only), BPE tokenizer, trainer (synthetic long-context tasks from
the eval workloads' generators + natural text), and the model card generator."""
