from tfctl.cli import main

main()
