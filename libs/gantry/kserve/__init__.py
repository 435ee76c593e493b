"""Generated from proto/inference/*.proto by `make proto`: the Open Inference Protocol
(KServe v2 / Triton gRPC), package `inference`."""
