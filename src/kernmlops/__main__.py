from kernmlops.cli import main

main()
