"""Data coming in, before any training: users' records converted to shards, and shards checked
and prepared for Energon.

* :mod:`.convert` (``energon-packing convert``): record files -> prepared shards, exactly once;
  :mod:`.sources` reads the record files, :mod:`.columns` renames their keys, :mod:`.reshape`
  and :mod:`.records` turn each record into our conversation document (:mod:`.turns`: the one
  reader of LLaVA / ShareGPT / role-content turns, the loader's too), :mod:`.media` loads and
  checks its media, :mod:`.tar_writer` writes the shards, :mod:`.diagnosis` says why a run
  converted too little;
* :mod:`.tar_walk` and :mod:`.shards`: what Energon and WebDataset would drop from a folder of
  tar shards, from the headers; :mod:`.media_check`: every image decoded, every video's header
  read (``energon-packing check``);
* :mod:`.prepare`: ``energon prepare`` with our yamls (``energon-packing prepare``).

Every record or sample not taken travels as :class:`~energon_packing.errors.Skip` with its
reason. The room imports the core, ``encoding`` and ``media`` and Energon's public CLI (in
``prepare`` only); the loader and the tools import it, the rest of the library never does
(``tests/test_layout.py``).
"""

__all__: list[str] = []
