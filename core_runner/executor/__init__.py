"""Running the model runner on one or several tensor-parallel ranks."""
