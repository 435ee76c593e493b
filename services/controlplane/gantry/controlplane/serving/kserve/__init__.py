"""The Open Inference Protocol (KServe v2 / Triton gRPC) front door: tensors in, the same Inference
handlers as gantry.v1.Inference below, tensors out (docs/kserve.md)."""
