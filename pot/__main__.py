from pot.cli import main

main()
