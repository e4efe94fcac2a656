"""A Hugging Face processor from a local directory: the family's own, or a loud error.

Rules (nothing is downloaded; a failure is never turned into a text tokenizer):

* A directory with no processor config (no ``preprocessor_config.json``,
  ``processor_config.json`` or ``video_preprocessor_config.json``) is a text model: its
  tokenizer is loaded (``AutoTokenizer``).
* Otherwise ``AutoProcessor`` builds the family's processor (its image processor on Pillow
  where torchvision is absent), or its error is raised with the fix.
* Where torchvision cannot be imported (a CPU-only torch wheel), a processor that also owns a
  video processor (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, LLaVA-OneVision, ...) cannot be built by
  ``AutoProcessor``: its video processor classes need torchvision. It is built image-only
  instead, by the processor class's own ``from_pretrained`` with the video processor left out
  (:func:`image_only`); images go through the same PIL image processor either way.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import types
from pathlib import Path
from typing import Any

from energon_packing.encoding import hf_compat
from energon_packing.errors import describe

__all__ = ["image_only", "load_processor", "video_settings"]

logger = logging.getLogger(__name__)

#: Files that make a directory a processor (anything else with a tokenizer: a text model).
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
#: What a text model's tokenizer is saved as (any one of them).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
VIDEO_FILES = ("video_preprocessor_config.json",)

_IMAGE_ONLY: dict[type, type] = {}


def image_only(cls: type) -> type:
    """``cls`` (a transformers processor class) without its video processor: same name, same
    image processing.

    transformers 5.x makes every processor that lists a ``video_processor`` load and
    type-check one, and the video processor classes import torchvision. The subclass drops the
    attribute from ``get_attributes`` (the list ``from_pretrained`` loads and ``__init__``
    checks); ``video_processor`` reads None (SmolVLM's: a falsy stand-in whose frame settings
    its own template call reads), so asking it for videos fails there, loudly.
    Instances pickle (to spawned loader workers): the class is found again by its qualified
    name through this module's ``__getattr__``.
    """
    if cls not in _IMAGE_ONLY:

        @classmethod
        def get_attributes(klass: type) -> list[str]:
            return [a for a in super(subclass, klass).get_attributes() if a != "video_processor"]

        subclass = type(
            cls.__name__,
            (cls, _no_video_kwarg()),
            {
                **_video_processor_optional(cls),
                **_video_processor_of(cls),
                "get_attributes": get_attributes,
                "__module__": __name__,
                "__qualname__": _PREFIX + cls.__name__,
                "__doc__": f"{cls.__name__} without its video processor (no torchvision).",
            },
        )
        _IMAGE_ONLY[cls] = subclass
    return _IMAGE_ONLY[cls]


_PREFIX = "_image_only_"


class _NoVideoProcessor:
    """An image-only processor's video processor where the class's own template call reads
    its settings on every conversation (SmolVLM's ``apply_chat_template``: the frame count and
    rate it passes on as defaults, None here: the rendered text does not depend on them).
    Falsy, as no video processor is; asked for videos, it refuses, naming why."""

    num_frames = None
    fps = None

    def __bool__(self) -> bool:
        return False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "this processor was built without its video processor (no torchvision): it "
            "takes no videos"
        )


def _video_processor_of(cls: type) -> dict:
    """``{"video_processor": ...}`` of the image-only class: a :class:`_NoVideoProcessor`
    where ``cls``'s own ``apply_chat_template`` reads its video processor's settings
    (SmolVLM's; None fails it), None elsewhere. A class attribute: nothing is changed on an
    instance, so one processor serves threads alike."""
    own = cls.__dict__.get("apply_chat_template")
    try:
        reads = own is not None and "self.video_processor." in inspect.getsource(own)
    except (OSError, TypeError):  # no source to read: None, as for the others
        reads = False
    return {"video_processor": _NoVideoProcessor() if reads else None}


def _video_processor_optional(cls: type) -> dict:
    """``{"__init__": ...}``: ``cls.__init__`` with ``video_processor`` defaulting to None,
    where it is required (Gemma 4's: ``from_pretrained`` passes the image-only attributes and
    nothing for it); ``{}`` elsewhere. The same code object (``from_pretrained`` reads its
    argument names from ``__code__``), given one default more."""
    init = cls.__init__
    params = list(inspect.signature(init).parameters.values())
    required = [
        p.name
        for p in params[1:]
        if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    if not required or required[-1] != "video_processor" or init.__code__.co_kwonlyargcount:
        return {}
    patched = types.FunctionType(
        init.__code__,
        init.__globals__,
        init.__name__,
        (None, *(init.__defaults__ or ())),
        init.__closure__,
    )
    patched.__kwdefaults__ = init.__kwdefaults__
    patched.__qualname__ = init.__qualname__
    return {"__init__": patched}


@functools.cache
def _no_video_kwarg() -> type:
    class NoVideoKwarg(hf_compat.processor_mixin()):
        """Sits between a processor class and ``ProcessorMixin``: a processor whose own
        ``__init__`` passes ``video_processor=`` on (Gemma 4's) hands it None, which the
        image-only attribute list would reject as an unexpected argument."""

        def __init__(self, *args: Any, **kwargs: Any):
            if kwargs.get("video_processor", 0) is None:
                del kwargs["video_processor"]
            # a processor whose own __init__ passes its attributes on by position (the Omni
            # ones: image, video, feature extractor, tokenizer) hands a None in the video
            # slot, which would shift the rest onto the wrong attributes
            if _defined_before(type(self), "__init__", NoVideoKwarg):
                full = type(self).__mro__[1].get_attributes()  # the class image_only wraps
                slot = full.index("video_processor") if "video_processor" in full else -1
                if 0 <= slot < len(args) and args[slot] is None:
                    args = args[:slot] + args[slot + 1 :]
            super().__init__(*args, **kwargs)

    return NoVideoKwarg


def _defined_before(cls: type, attribute: str, base: type) -> bool:
    """Whether a class of ``cls``'s MRO before ``base`` defines ``attribute`` itself: for
    ``__init__``, the arguments reaching ``base`` are laid out by that ``__init__``, not by the
    image-only attributes; for ``from_pretrained``, the class loads its parts its own way."""
    mro = cls.__mro__
    return any(attribute in vars(k) for k in mro[: mro.index(base)])


def __getattr__(name: str) -> type:
    """Module attributes ``_image_only_<Processor>`` (how pickle finds :func:`image_only`
    classes in a fresh process)."""
    found = _transformers_class(name[len(_PREFIX) :]) if name.startswith(_PREFIX) else None
    if found is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return image_only(found)


def _processor_class_name(path: Path) -> str | None:
    for name in (*PROCESSOR_FILES, "tokenizer_config.json"):
        file = path / name
        if file.is_file():
            try:
                found = json.loads(file.read_text()).get("processor_class")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(found, str):
                return found
    return None


def _torchvision_available() -> bool:
    return hf_compat.torchvision_available()


def load_processor(path: str | Path) -> Any:
    """The processor saved in a local directory (or, for a text model, its tokenizer).

    Raises:
        ValueError: the path is no directory, or the processor (or tokenizer) it holds does not
            load; the message carries the loader's error and the fix.
    """
    from transformers import AutoProcessor, AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"processor path {str(path)!r} is not a directory (nothing is downloaded)")
    if not any((path / name).is_file() for name in (*PROCESSOR_FILES, *VIDEO_FILES)):
        if not any((path / name).is_file() for name in TOKENIZER_FILES):
            raise ValueError(
                f"{path} is no Hugging Face model directory: it holds no processor config "
                f"({', '.join(PROCESSOR_FILES)}) and no tokenizer ({', '.join(TOKENIZER_FILES)}); "
                f"pass the folder save_pretrained wrote (or the hub snapshot folder)"
            )
        try:  # a text model: its tokenizer (and the chat template it carries)
            return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as e:
            raise ValueError(
                f"{path} holds no processor config ({', '.join(PROCESSOR_FILES)}), so it is read "
                f"as a text model, but its tokenizer does not load: {_cause(e)}"
            ) from e
    class_name = _processor_class_name(path)
    model_type = _config_model_type(path)
    _refuse_refused_model(path, class_name, model_type)
    _require_family_packages(path, class_name, model_type)
    processor_cls = _transformers_class(class_name)
    if (
        processor_cls is not None
        and "video_processor" in processor_cls.get_attributes()
        and not _torchvision_available()
    ):
        logger.info(
            "%s: building %s without its video processor (no torchvision)", path, class_name
        )
        try:
            # video_processor=None where the class has its own from_pretrained, which loads the
            # video processor unless one is given (ERNIE-4.5-VL's, 5.25: it imports
            # torchvision); elsewhere the keyword would take a positional slot (before 5.25)
            own = _defined_before(processor_cls, "from_pretrained", hf_compat.processor_mixin())
            given = {"video_processor": None} if own else {}
            processor = image_only(processor_cls).from_pretrained(
                str(path), local_files_only=True, **given
            )
        except Exception as e:
            raise ValueError(
                f"{path}: {class_name} (image-only: torchvision is not installed) does not "
                f"load: {_cause(e)}. Fix the directory; {_TEXT}"
            ) from e
        settings = video_settings(path)
        if settings is not None:  # they still decide how videos are sampled and sized
            processor.video_settings = settings
        return _with_model_settings(processor, path)
    try:
        processor = AutoProcessor.from_pretrained(str(path), local_files_only=True)
    except Exception as e:
        raise ValueError(
            f"{path}: the processor ({class_name or 'class not named in its config'}) does not "
            f"load: {_cause(e)}. Fix the directory (or install what the error names); {_TEXT}"
        ) from e
    if getattr(processor, "image_processor", None) is None:
        raise ValueError(
            f"{path} holds a processor config, but AutoProcessor built a "
            f"{type(processor).__name__}, not a processor with an image processor; {_TEXT}"
        )
    return _with_model_settings(processor, path)


def _refuse_refused_model(path: Path, class_name: str | None, model_type: str | None) -> None:
    """Raises the refusal line (:data:`~.families.REFUSED`) where the directory's
    ``config.json`` names a refused model type, before its processor is built: a processor that
    needs more than is installed (Phi-4-multimodal's torchvision) would hide why in an
    ImportError."""
    from energon_packing.encoding.families import REFUSED, refusal

    if model_type in REFUSED:
        raise ValueError(f"{path}: {refusal(class_name or 'its processor', model_type)}")


def _require_family_packages(path: Path, class_name: str | None, model_type: str | None) -> None:
    """Raises, in one line, where the family of ``class_name`` (or, where the class is none of
    a family's, of the ``config.json``'s model type: Kimi-K2.5's hub directory names its
    remote-code ``KimiK25Processor``) needs a package that does not import here
    (``Family.needs``: PixtralProcessor's torchvision), before ``AutoProcessor`` fails on it
    with transformers' several-line ImportError."""
    from energon_packing.encoding.families import FAMILIES, family_of_model

    family = next((f for f in FAMILIES if class_name in f.classes), None)
    family = family or family_of_model(model_type)
    missing = [name for name in (family.needs if family else ()) if not _importable(name)]
    if missing:
        raise ValueError(
            f"{path}: {class_name} (the {family.name} family) needs {', '.join(missing)}, "
            f"which does not import here: transformers builds it only with "
            f"{', '.join(missing)} (pip install {' '.join(missing)}, the release built for your "
            f"torch; CI runs torch 2.14.1 + torchvision 0.29.1: docs/compatibility.md); {_TEXT}"
        )


def _config_model_type(path: Path) -> str | None:
    """The ``model_type`` of the directory's ``config.json`` (None: none readable)."""
    try:
        return json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def _importable(name: str) -> bool:
    if name == "torchvision":
        return _torchvision_available()
    import importlib.util

    return importlib.util.find_spec(name) is not None


def video_settings(path: Path | str) -> dict | None:
    """A model directory's video processor settings, found where transformers 5 looks:
    ``processor_config.json``'s ``video_processor`` entry (what ``save_pretrained`` writes),
    then ``video_preprocessor_config.json``, then ``preprocessor_config.json`` (published
    Qwen2-VL and Qwen2.5-VL checkpoints: the video processor takes the image processor's
    settings, its pixel bounds included)."""
    path = Path(path)
    for name, entry in (
        ("processor_config.json", "video_processor"),
        (VIDEO_FILES[0], None),
        ("preprocessor_config.json", None),
    ):
        try:
            found = json.loads((path / name).read_text())
        except (OSError, ValueError):
            continue
        if entry is not None:
            found = found.get(entry) if isinstance(found, dict) else None
        if isinstance(found, dict):
            return found
    return None


def _with_model_settings(processor: Any, path: Path) -> Any:
    """``processor`` with what the directory's model ``config.json`` says of positions
    (``vision_config.tokens_per_second``, Qwen2.5-VL, so the knob can be checked against it;
    the Omni thinkers' ``position_id_per_seconds`` and ``seconds_per_chunk``, top level or
    under ``thinker_config``)."""
    try:
        config = json.loads((path / "config.json").read_text())
        found = config.get("vision_config", {}).get("tokens_per_second")
        thinker = config.get("thinker_config", config)
        per_second = thinker.get("position_id_per_seconds")
        per_chunk = thinker.get("seconds_per_chunk")
    except (OSError, ValueError, AttributeError):
        return processor
    if isinstance(found, (int, float)) and not isinstance(found, bool):
        processor.model_tokens_per_second = found
    if isinstance(per_second, (int, float)) and not isinstance(per_second, bool):
        processor.model_position_id_per_seconds = per_second
    if isinstance(per_chunk, (int, float)) and not isinstance(per_chunk, bool):
        processor.model_seconds_per_chunk = per_chunk
    return processor


_TEXT = (
    "for text only, pass processor=AutoTokenizer.from_pretrained(DIR) (its chat template) or "
    "tokenizer=DIR (--tokenizer DIR: the built-in ChatML layout)"
)


def _cause(error: Exception) -> str:
    """The loader's error in one line, cut where transformers lists every known type."""
    return " ".join(describe(error).split())


def _transformers_class(name: str | None) -> type | None:
    if not name:
        return None
    import transformers

    try:
        return getattr(transformers, name)
    except (AttributeError, ImportError):
        return None
