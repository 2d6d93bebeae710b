"""Client tools for a SageMaker endpoint, run on the user's machine with boto3 (`make deploy`): deploy creates,
updates and deletes the endpoint, invoke calls it, stream_reader reads its streamed answers. Kept out of the
image; they read the container's settings table (serving.settings) to check a configuration before deploying."""
