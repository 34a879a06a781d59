"""The admission webhook: POST /mutate and POST /validate (AdmissionReview v1) over the placement core."""
