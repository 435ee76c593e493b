"""The inference front doors (gantry.v1 Inference, the Open Inference Protocol, the OpenAI-
compatible HTTP API): validation, routing, cost, answers, and capability degradation.
"""
