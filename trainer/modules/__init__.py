"""GEM building blocks: nn.Modules composed from :mod:`trainer.ops`."""
