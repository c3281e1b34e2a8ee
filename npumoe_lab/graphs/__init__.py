"""Static NPU graphs: torch modules of fixed shape (modules), Core ML and ONNX builders (coreml, onnx), Linux-side
validation (validate, validate_attention, milnumpy), a content-addressed cache (cache), the plan -> graphs
orchestration (spec, build) and the `npumoe-lab convert` command (convert). coremltools and onnx are imported
only when a graph is built or read, so importing this package stays cheap."""
from npumoe_lab.graphs.build import build_graphs, model_parts
from npumoe_lab.graphs.cache import GraphCache
from npumoe_lab.graphs.modules import ChunkAttention, GroupFFN, chunk_inputs, from_layout, to_layout
from npumoe_lab.graphs.spec import AttentionGraphSpec, GroupGraphSpec, Limits, group_specs, subset

__all__ = ["AttentionGraphSpec", "ChunkAttention", "GraphCache", "GroupFFN", "GroupGraphSpec", "Limits",
           "build_graphs", "chunk_inputs", "from_layout", "group_specs", "model_parts", "subset", "to_layout"]
