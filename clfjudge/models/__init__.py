"""Models: what a judge reads with. Backbones (offline aliases, hub ids or local directories -> tokenizer +
model; ``backbones``), the checksummed offline weight packages (``offline_weights``), the prediction heads a
backbone is fine-tuned with (``heads``) and the onnxruntime session every ONNX model opens (``onnx_session``)."""
