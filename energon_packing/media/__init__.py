"""Media the families' processors read with tensors: videos, decoded with PyAV and processed
with torch exactly as transformers' video processors do (:mod:`.video`). May import torch and
numpy; never the loader, the trainer or Energon."""
