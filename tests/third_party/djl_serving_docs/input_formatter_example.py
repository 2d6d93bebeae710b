# model.py
from djl_python.input_parser import input_formatter
from djl_python.encode_decode import decode

@input_formatter
def custom_input_formatter(decoded_payload: dict, tokenizer=None, **kwargs) -> dict:
    """
    Custom input formatter for vLLM/TensorRT-LLM backends.
    Transforms custom payload format to expected format.
    
    Args:
        decoded_payload (dict): Decoded request payload
        tokenizer: Tokenizer instance (optional)
        **kwargs: Additional arguments
        
    Returns:
        (dict): Transformed payload in expected format
    """
    # Example: Transform custom "inputPrompt" field to "inputs"
    if "inputPrompt" in decoded_payload:
        decoded_payload["inputs"] = decoded_payload.pop("inputPrompt")
    
    # Example: Set default parameters
    if "parameters" not in decoded_payload:
        decoded_payload["parameters"] = {}
    
    decoded_payload["parameters"].setdefault("max_new_tokens", 256)
    
    return decoded_payload
