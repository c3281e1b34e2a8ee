"""Kernels and numerics the engine calls: packing (dispatch / pack / scatter), CPU expert FFNs, NPU numerics,
prepared-weight cache, saliency scores, CPU feature detection. No knowledge of plans or platforms."""
