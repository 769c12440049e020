"""How large a model a loader accepts, as plain numbers (no torch), so settings and commands can show them.

:mod:`cahp_engine.models._preflight` enforces them before any tensor of a model is allocated.
"""

from __future__ import annotations

#: Default of the parameter limit (``max_params``; the service's ``CAHP_MAX_MODEL_PARAMS``,
#: ``--max-model-params`` of ``cahp prune`` and ``cahp export``). The largest supported encoder,
#: XLM-RoBERTa-XL, has 3.5e9 parameters with its head, DeBERTa-v3-large 4.4e8. XLM-RoBERTa-XXL
#: (1.07e10, the same model type) is above it: its float32 weights alone take 43 GB, and fine-tuning
#: it (recovery) about four times that, more than one worker machine is assumed to have.
DEFAULT_MAX_MODEL_PARAMS = 4_000_000_000

#: Most classes a ``config.json`` may declare: transformers builds an ``id2label`` table of that many
#: entries while it parses the config, before any other check could run.
MAX_NUM_LABELS = 100_000

#: Most encoder layers a config may declare, whatever its weights hold. Every layer is a few dozen Python
#: modules even on the meta device (1000 DeBERTa layers take seconds and about 200 MB to build), and a
#: safetensors header can name a tiny tensor for each of a million layers. The deepest supported
#: encoders have 48.
MAX_LAYERS = 1024

#: Most elements of the buffers a model builds from its config rather than reads from its weights
#: (``position_ids`` and ``token_type_ids`` of ``max_position_embeddings`` entries, rotary
#: frequencies). A real model has a few thousand; 2**24 int64 elements are 128 MiB.
MAX_UNSAVED_BUFFER_ELEMENTS = 1 << 24

#: Longest safetensors JSON header read. The format allows 100 MB; a real header takes about 150 bytes
#: per tensor (BERT-base: 30 KB; a 70e9-parameter decoder's largest shard: under 100 KB), and a parsed
#: header costs tens of times its size in Python objects, so a 104 MB header of zeros once took a process
#: to 1.9 GB. 8 MiB holds some 50,000 tensors' entries.
MAX_SAFETENSORS_HEADER_BYTES = 8 * 1024 * 1024

#: Most dimensions of one tensor (transformer weights have one to four).
MAX_TENSOR_RANK = 8
