"""Model backends behind the Embedder protocol. torch/transformers are imported lazily."""
