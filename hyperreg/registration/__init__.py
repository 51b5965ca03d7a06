"""registration"""
