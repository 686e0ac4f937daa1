"""The daily report job (`lakehouse run report`): clicks x dimensions -> member_daily_report."""
