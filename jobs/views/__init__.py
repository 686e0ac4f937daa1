"""The product views job (`lakehouse run views`): clicks -> ads_behavior.product_views."""
