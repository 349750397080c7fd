"""The pipeline's stages (prepare_data, train, evaluate), the code they share (common) and their images."""
