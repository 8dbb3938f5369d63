"""The engine's set-up, in the process that serves requests (``serve``, ``generate``, the Python
API): one vLLM ``AsyncLLM`` and what it needs before and around its start.

``async_engine`` starts the engine from ``EngineConfig`` (vLLM's arguments built as vLLM's own
server builds them, ``engine_args``; the dtype ``auto`` means on this host, ``dtype``; the engine
core with its worker inside on CPU, ``engine_process``) and hands requests to it; ``environment``
sets what vLLM reads from the environment before it is imported; ``model_home`` and
``model_info`` find the model and read its tokenizer facts without vLLM; ``sampling`` turns a
request's options into vLLM's ``SamplingParams``; ``warm_up`` sends the first constrained request.

Separate from ``service/vllm_core``, which vLLM runs in the engine core process it spawns from
here, and from ``service/request``, which runs each request on a started engine: this package
holds what happens once per engine, before the first request.
"""
