"""GEM, its ablations and the DLRM / DCNv2 baselines, all fed the same Batch."""
