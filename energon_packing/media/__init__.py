"""Images, videos and audio clips as the families' processors read them, behind one pattern:
at encode time a medium is costed from its header alone (a conversation waiting in the packing
buffer holds its compressed bytes); at pack time, for the pack being emitted only, it is
decoded to pixels (images, video frames) or samples (audio, which a processor's feature
extractor turns into features).

* images: :mod:`.images` (size from the header: ``probe``; RGB pixels: ``decode``, under the
  alpha rule the caller passes); the families' image rules and processors are the encoding
  side's (``encoding.image_rules``, ``encoding.processor_images``, ``encoding.vision``);
* videos: :mod:`.video` (header: ``probe``; frames: ``decode``, ``process``), the families'
  styles and rules as data (:mod:`.video_styles`, :mod:`.video_rules`), a video's plan from
  its header (:mod:`.video_plan`) and a layout's video work (:mod:`.video_side`);
* audio: :mod:`.audio` (sample count: ``length``, from the header where exact; 16 kHz mono
  samples: ``decode``), the families' rules as data (:mod:`.audio_rules`); the processor's
  audio side is the encoding side's (``encoding.processor_audio``).

May import torch (lazily: videos' pixels), numpy, PIL and PyAV; of this package only the core's
errors and resize rule, never the encoding room, the loader, the trainer or Energon: what
follows the installed transformers (its alpha rule) is passed in by the encoding side.
"""
