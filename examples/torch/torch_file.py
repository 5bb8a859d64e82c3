"""Reading a ``torch.save`` file without running code from it.

A pickle may name any Python callable (``os.system``) and call it while it
loads, so ``torch.load`` as such runs whatever a file downloaded from the
internet carries. :func:`load_state_dicts` lets a file name only what
PyTorch's own weights-only loader allows (tensors, storages, dtypes,
``torch.Size``, ``OrderedDict`` and the tensor rebuild functions; numbers,
strings, lists, tuples and dicts need no name) and refuses anything else in
one line, before it is called. torch 1.13's ``weights_only=True`` cannot
read a float (an optimizer's ``lr``) and its ``torch.load`` ignores a
``pickle_module``, so the same allow-list runs here in Python's own
unpickler, where only the lookup of names is restricted, through the two
loaders ``torch.load`` itself calls (the zip format, and the legacy one).
"""

import pickle

import torch

from safetensors_file import RunFileError


def _allowed_globals():
    """PyTorch's weights-only allow-list: {"module.name": object}."""
    try:
        from torch._weights_only_unpickler import _get_allowed_globals
    except ImportError:  # a torch without it: the allow-list's core
        import collections
        return {"collections.OrderedDict": collections.OrderedDict,
                "torch._utils._rebuild_tensor_v2": torch._utils._rebuild_tensor_v2,
                "torch._utils._rebuild_parameter": torch._utils._rebuild_parameter}
    return _get_allowed_globals()


class RefusedGlobal(pickle.UnpicklingError):
    """The file names a Python object outside the allow-list (its name is ``name``)."""

    def __init__(self, name):
        super().__init__(name)
        self.name = name


class _Unpickler(pickle.Unpickler):
    """Python's unpickler, finding only the allow-list's names."""

    def find_class(self, module, name):
        allowed = _allowed_globals().get(f"{module}.{name}")
        if allowed is None:
            raise RefusedGlobal(f"{module}.{name}")
        return allowed


class _RestrictedPickle:
    """What ``torch.load`` takes as ``pickle_module``: the unpickler above, and its ``load``."""

    Unpickler = _Unpickler
    __name__ = "halfstep restricted pickle"

    @staticmethod
    def load(file, **options):
        return _Unpickler(file, **options).load()


def _load(path):
    """``torch.load(path, map_location="cpu")``'s two branches, with the restricted unpickler."""
    serialization = torch.serialization
    with open(path, "rb") as f:
        if serialization._is_zipfile(f):
            with serialization._open_zipfile_reader(f) as archive:
                if serialization._is_torchscript_zip(archive):
                    raise RefusedGlobal("torch.jit.load (a TorchScript archive)")
                return serialization._load(archive, "cpu", _RestrictedPickle, encoding="utf-8")
        return serialization._legacy_load(f, "cpu", _RestrictedPickle, encoding="utf-8")


def load_state_dicts(path):
    """What ``torch.save`` wrote at ``path``, on the CPU, built only from allowed names.

    RunFileError in one line when the file is missing, is not a torch.save
    file, or names anything else (code: never called).
    """
    try:
        return _load(path)
    except FileNotFoundError:
        raise RunFileError(f"{path}: no such file") from None
    except RefusedGlobal as e:
        raise RunFileError(
            f"{path}: refused: loading it would call {e.name}, which is not a tensor, number, "
            "string or container (a pickle can run code); save only state dicts "
            "(torch.save({'model': model.state_dict(), ...}))") from None
    except Exception as e:  # truncated or not a torch.save file: pickle, zip and EOF errors
        raise RunFileError(f"{path}: not a readable torch.save file ({type(e).__name__})") from None
