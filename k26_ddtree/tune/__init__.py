"""`k26-deploy tune`: DDTree configs and the batch-size schedule from a server trace and bench step times."""
