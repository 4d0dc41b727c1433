//! Running the real `graceguard-webhook` against the bed (filled in with the webhook).
