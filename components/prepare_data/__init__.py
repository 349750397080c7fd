"""The prepare_data stage: CIFAR-10 to validated, sharded, checksummed TFRecords with a manifest."""
