from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "playground.accounts"
    label = "accounts"
    verbose_name = "Accounts and limits"
