"""The OpenAI-compatible protocol: request/response models (`openai`) and the error shape (`errors`)."""
