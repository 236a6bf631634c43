"""Code generators: an FX graph of aten ops -> a callable list[Tensor] -> list[Tensor]."""
