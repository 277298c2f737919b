"""The one way the applications write `get_config` and `from_config`.

A layer, model or preprocessor of the applications keeps each argument of
its constructor (but `**kwargs`) as an attribute of the same name, checked
or normalized as it likes. `ArgumentConfig` reads the names from the
constructor's signature (and those of its bases), so `get_config` returns
them without listing them again, and `from_config` calls the constructor.
"""

import inspect


def constructor_arguments(cls):
    """The names of the arguments of `cls.__init__` (not `self`, `**kwargs`)."""
    parameters = inspect.signature(cls.__init__).parameters
    return tuple(
        name
        for name, parameter in parameters.items()
        if name != "self"
        and parameter.kind
        in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    )


class ArgumentConfig:
    """`get_config()`: the constructor's arguments, read from attributes.

    `config_keys` is set for every subclass: the arguments of its
    constructor after those of its bases' (a subclass constructor that
    passes the shared ones on with `**kwargs` names only its own). The
    config starts from the next class's `get_config` (a Keras layer's name,
    dtype, ...), or is empty for a plain object; a class may also set
    `config_keys` itself.
    """

    config_keys = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "config_keys" in cls.__dict__:
            return
        inherited = tuple(
            key for base in cls.__bases__ for key in getattr(base, "config_keys", ())
        )
        cls.config_keys = tuple(
            dict.fromkeys(inherited + constructor_arguments(cls))
        )

    def keep_config(self, arguments):
        """Keeps each of `config_keys` from `arguments` (the constructor's
        `locals()`) as an attribute; `attention_kwargs` as a new dict."""
        for key in self.config_keys:
            value = arguments[key]
            if key == "attention_kwargs":
                value = dict(value or {})
            setattr(self, key, value)

    def base_config(self):
        """The config the arguments are added to."""
        parent = getattr(super(), "get_config", None)
        return parent() if parent is not None else {}

    def get_config(self):
        config = self.base_config()
        config.update({key: getattr(self, key) for key in self.config_keys})
        return config

    @classmethod
    def from_config(cls, config):
        # A Keras layer's own `from_config` (dtype policies) calls the
        # constructor too.
        parent = getattr(super(), "from_config", None)
        if parent is not None:
            return parent(config)
        return cls(**config)


class FunctionalConfig(ArgumentConfig):
    """`ArgumentConfig` for a functional model, rebuilt by its constructor.

    Its config is its arguments, name and trainability, not the graph that
    `keras.Model.get_config` would describe.
    """

    def base_config(self):
        return {"name": self.name, "trainable": self.trainable}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
