"""The model seam: messages, tool calls and usage; the built-in ``scripted`` model and the
``openai`` backend; a conversation as the chat messages a step sees."""
