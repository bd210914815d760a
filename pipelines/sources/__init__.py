"""Where events come from: the synthetic world, MovieLens, and raw events on Kafka."""
