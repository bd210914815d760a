"""What the trainer reads: feature-job outputs, Kafka example topics, and the batch
every model consumes.
"""
