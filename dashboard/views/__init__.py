"""One Streamlit page script per module (run by ``abl.dashboard.app``, not imported)."""
