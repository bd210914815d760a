"""What the trainer measures and reports: progressive validation, calibration, the
/metrics endpoint.
"""
