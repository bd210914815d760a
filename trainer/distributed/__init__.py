"""How the model is spread over ranks: replicated or model-parallel tables."""
