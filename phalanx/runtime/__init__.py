"""Process launch, checkpoints, fault injection."""
