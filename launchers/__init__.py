"""What tests, demos and benchmarks start beside the jobs: the embedded Kafka broker."""
