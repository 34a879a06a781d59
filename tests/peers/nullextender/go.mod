module model-placement/tests/peers/nullextender

go 1.24
