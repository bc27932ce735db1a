from gpuledger.cli.main import main

main()
