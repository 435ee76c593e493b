"""Managed servers: an OpenAI-compatible server process (llama.cpp's, vLLM's) run by the worker
as a child, bound to loopback on a port the worker allocates, supervised like a model host."""
