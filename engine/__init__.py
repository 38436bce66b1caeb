"""Cotrain engine: collaborative training over WebRTC, coordinated by a backbone."""

import os

__version__ = "0.1.0"

# A project sends data, never code. transformers (through `kernels`, which it requires since
# 5.25) fetches compiled kernels from a model hub when a model asks for one, unless
# USE_HUB_KERNELS says no; huggingface_hub reads HF_HUB_OFFLINE once, at import. Every Cotrain
# process imports this package before either, so neither a project nor a future default of
# those libraries can make a volunteer's computer fetch code, whatever the environment says.
os.environ["USE_HUB_KERNELS"] = "NO"
os.environ["HF_HUB_OFFLINE"] = "1"
