"""Commands that talk to the deployed (or about-to-be-deployed) AWS environment."""
