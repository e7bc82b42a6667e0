"""Media (image, video, audio) planning and decoding for the task encoders."""
