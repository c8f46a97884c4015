"""One flat constructor signature for a family of classes, so that a subclass states only its
own arguments (`**kwargs` hands the rest on) and its `defaults` for inherited ones (used by
`lit_rlhf.data.base.RLHFDataModule`, whose CLI help and config defaults come from it)."""

from __future__ import annotations

import inspect
from typing import Any, Callable


def flat_init(cls: type, root: type) -> Callable:
    """`cls`'s constructor with one flat signature: `root`'s arguments as they are, then every
    subclass's own from the base down (keyword-only), with the `defaults` of `cls` and its bases. The
    CLI reads this signature (its defaults are what a config leaves out) and Python calls bind to
    it, so both get the same defaults; `hparams` records every argument (a tokenizer only by name)."""
    raw = vars(cls).get("__init__")
    params: dict[str, inspect.Parameter] = {}
    defaults: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if not issubclass(klass, root):
            continue
        own = raw if klass is cls else vars(klass).get("__init__")
        own = getattr(own, "raw_init", own)
        if own is not None:
            for p in list(inspect.signature(own, eval_str=True).parameters.values())[1:]:
                if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                    params[p.name] = p if klass is root else p.replace(kind=p.KEYWORD_ONLY)
        defaults.update(vars(klass).get("defaults", {}))
    if unknown := set(defaults) - set(params):
        raise TypeError(f"{cls.__name__}.defaults names no argument: {sorted(unknown)}")
    signature = inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)] +
                                  [p.replace(default=defaults.get(n, p.default)) for n, p in params.items()])
    parent_init = super(cls, cls).__init__

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = {k: v for k, v in bound.arguments.items() if k != "self"}
        (raw or parent_init)(self, **arguments)
        if type(self) is cls:  # the outermost class records the whole call
            tokenizer = arguments["tokenizer"]
            if not isinstance(tokenizer, (str, type(None))):
                arguments.pop("tokenizer")
            self.save_hyperparameters(arguments)

    __init__.__signature__ = signature
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.raw_init = raw
    return __init__
