"""The lowering's errors, in a module of their own: the training process
catches them without importing the converter (sympy, Dynamo's shapes)."""


class ConversionError(RuntimeError):
    """A node the converter cannot express; names the op and its source line."""


class NoSymbolicShapes(ConversionError):
    """An op torch has no shape function for on symbolic sizes (no meta
    kernel: aten::geqrf): its group compiles static, which is no failure."""
