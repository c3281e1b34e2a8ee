"""Routing data measured on real MoE checkpoints: one schema (schema.py) and readers for the formats researchers
already produce (llama.cpp moe-trace, vLLM / SGLang routed experts, SGLang EPLB, TensorRT-LLM expert statistics, HF
router logits, the workbench's own profiles, and the layouts of public routing files)."""
